"""How much of each batch's loading the program's own hottest lines hold (pure).

The input of ``input_bound``'s "make each sample cheaper" option: with ``num_workers=0`` the
training thread runs the Dataset itself, so the stack samples of the ``data`` phase
(:func:`whyidle.analysis.stacks.hotspots`) say which of the program's lines prepare the samples
(``__getitem__``, its transforms, a ``collate_fn``) and how much of the loading time each holds.
The estimate assumes the program's own per-sample work is vectorized over the batch or computed
once and cached, so *its* time leaves the step and everything else the loader does stays: PyTorch's
own fetching and collating (time whose innermost user frame is the loop line, :data:`LOADER_LEAVES`),
image decoding (:data:`DECODE_LEAVES`), and library code called from outside the program. The
report names the hottest lines (those at :data:`HOT_MIN_SHARE` of the loading time or more). With
workers the training thread only waits on their queue (the workers'
own stacks are not sampled), so there is no measurement and :func:`measured_cost` says None.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Innermost frames of the DataLoader's own per-batch work (fetching the samples, collating them):
#: what a cheaper Dataset leaves in place.
LOADER_LEAVES = ("torch/utils/data/",)
#: Innermost frames of image decoding: a line running them is made cheaper by decoding at reduced
#: size, not removed (a decoded dataset rarely fits in memory), so the estimate keeps its time.
DECODE_LEAVES = ("PIL/ImageFile.py", "PIL/JpegImagePlugin.py", "PIL/PngImagePlugin.py", "imageio/", "cv2",
                 "torchvision/io/", "turbojpeg", "simplejpeg")
#: PIL functions of ``PIL/Image.py`` that read an image file when they are the innermost frame
#: (``Image.open``'s header read). Decoding itself runs under ``PIL/ImageFile.py load``
#: (:data:`DECODE_LEAVES`), also when ``convert`` or ``draft`` trigger it: an innermost
#: ``Image.py convert`` or ``load`` is an in-memory conversion (``ImageEnhance.Color`` and ``Contrast``
#: convert every sample), sampled at 2 ms over ``Image.open(jpeg).convert("RGB")``: 619 samples in
#: ``ImageFile.py load``, none in ``Image.py convert``.
PIL_DECODE = ("open",)
#: A line of the program counts as a hot line when it holds at least this share (0–1) of the
#: loading time: below it, rewriting the line would gain less than run-to-run noise (±2–9 %).
HOT_MIN_SHARE = 0.05
#: Hot lines counted at most (the terminal shows as many).
HOT_LINES = 3


@dataclass(frozen=True)
class HotLine:
    """One of the program's lines in the loading path: ``site`` (``file:line function``), ``code``
    (its source text or None), ``share`` (fraction 0–1 of the loading time under it, its callees
    included), ``leaf`` (the innermost frame most of that time ran, e.g. a pandas function)."""

    site: str
    code: str | None
    share: float
    leaf: str | None


@dataclass(frozen=True)
class SampleCost:
    """The measured cost split of loading one batch: ``lines`` (the hot lines, hottest first),
    ``removed`` (fraction 0–1 of the loading time they hold together), ``cost`` (1 − removed: the
    loading left once they cost nothing, as a fraction of today's)."""

    lines: tuple[HotLine, ...]
    removed: float

    @property
    def cost(self) -> float:
        return max(0.0, 1.0 - self.removed)


#: Calls that read an encoded image, as a line of the program writes them: the line decodes even
#: where its most-sampled innermost frame is the resize after it (image_decode_main's
#: ``Image.open``: 2 % of the loading under ``JpegImagePlugin``, the decode under the next line's
#: ``resize`` most of the time).
READ_CALLS = ("Image.open(", "decode_jpeg(", "decode_image(", "read_image(", "imread(", "imdecode(")


def reads_images(code: str | None) -> bool:
    """True when a line's source ``code`` calls one of :data:`READ_CALLS`."""
    return bool(code) and any(c in code for c in READ_CALLS)


def decoding(hotspots: list[dict] | None) -> bool:
    """The data phase decodes images: a hotspot's or listed line's innermost frame decodes
    (:func:`decodes`) or a listed line reads an image file (:func:`reads_images`)."""
    for h in hotspots or []:
        for line in [h] + list(h.get("lines") or []):
            if decodes(line.get("leaf") or "") or reads_images(line.get("code")):
                return True
    return False


def decodes(leaf: str) -> bool:
    """True when ``leaf`` (``path:line function``) is image decoding (:data:`DECODE_LEAVES`, or PIL's
    ``Image.open``: :data:`PIL_DECODE`)."""
    return any(p in leaf for p in DECODE_LEAVES) or ("PIL/" in leaf and leaf.rsplit(" ", 1)[-1] in PIL_DECODE)


def _kept(line: dict) -> bool:
    """True when a line's time stays after the fix: PyTorch's fetching and collating
    (:data:`LOADER_LEAVES`) or image decoding."""
    leaf = line.get("leaf") or ""
    return any(p in leaf for p in LOADER_LEAVES) or decodes(leaf)


def measured_cost(hotspots: list[dict] | None, data_share: float, num_workers: int | None,
                  focus: dict | None = None) -> SampleCost | None:
    """The loading left if the program's own per-sample work cost nothing, or None when it was not
    measured: loading in workers (their stacks are not sampled), no data wait, or no function of
    the program's with a line at :data:`HOT_MIN_SHARE` of the loading time.

    Each of the program's functions in the loading path (the ``data`` phase's hotspots that are not
    library or framework time) counts whole, less its lines that stay (:func:`_kept`: the loader's
    collation, image decoding); a function without ``lines`` counts as one line. Where the loading
    decodes images, a function counts only its listed lines that do not stay: the lines not listed
    (the hotspots list the busiest :data:`whyidle.analysis.stacks.LINES_PER_HOTSPOT`) may be the
    decoding (a PIL pipeline's ``Image.open(...).convert``: 10 % of the loading under two augmentation
    lines of 89 % would otherwise count as removed, and the estimate be the "loading cost nothing" ceiling). ``lines`` of the
    result are the hottest lines that count, at most :data:`HOT_LINES`, for the report.

    Args:
        hotspots: the ``data`` phase's hotspots (``share`` = fraction of the summed step time,
            ``library``/``framework`` flags, ``leaf``, per line ``lines``), as
            :func:`whyidle.analysis.stacks.hotspots` gives.
        data_share: the data wait's fraction (0–1) of the step time the shares are of.
        num_workers: the DataLoader's ``num_workers`` (None or 0: the training process loads).
        focus: the program's function holding most of the data phase inclusively
            (``facts.focus["data"]``, ``share_of_phase`` 0–1, e.g. ``encode`` under ``__getitem__``):
            the hotspots list only the busiest functions, so a tokenizer spread over many small
            helpers counts at least that function's share, less the lines that stay (c07: 61 %
            from the helpers listed, 98 % under ``encode``; measured 2.6x against 1.66x before);
            not where the loading decodes images (the decoding stays, and may not all be listed).
    """
    if num_workers or not hotspots or data_share <= 0:
        return None
    decoded = decoding(hotspots)
    removed = 0.0
    lines: list[HotLine] = []
    for h in hotspots:
        if h.get("library") or h.get("framework"):
            continue  # not the program's own preparation
        listed = h.get("lines") or [h]
        kept = sum(line.get("share") or 0.0 for line in listed if _kept(line))
        if decoded and h.get("lines"):  # the function's lines not listed may be decoding: not counted
            removed += sum(line.get("share") or 0.0 for line in listed if not _kept(line)) / data_share
        else:
            removed += max(0.0, (h.get("share") or 0.0) - kept) / data_share
        lines += [HotLine(line.get("site") or h.get("function") or "?", line.get("code"),
                          min(1.0, (line.get("share") or 0.0) / data_share), line.get("leaf"))
                  for line in listed if not _kept(line)]
    lines = sorted((h for h in lines if h.share >= HOT_MIN_SHARE), key=lambda h: -h.share)[:HOT_LINES]
    if not lines:
        return None
    listed = [line for h in hotspots for line in (h.get("lines") or [h])]
    if focus and focus.get("share_of_phase") and not any(decodes(line.get("leaf") or "") for line in listed):
        # (image decoding is kept, and the hotspots may not list all of it: no floor then)
        kept = sum(line.get("share") or 0.0 for line in listed if _kept(line))
        removed = max(removed, focus["share_of_phase"] - kept / data_share)
    return SampleCost(tuple(lines), min(1.0, removed))


def describe(cost: SampleCost) -> str:
    """The measured split as a phrase: ``"the program's own per-sample code holds 93 % of the
    loading time (`values = ...` (pandas_rows.py:51) 71 %, ...)"``."""
    parts = []
    for h in cost.lines:
        path, _, rest = h.site.rpartition(":")
        where = f"{path.rsplit('/', 1)[-1]}:{rest.split(' ')[0]}" if path else h.site
        parts.append((f"`{h.code}` ({where})" if h.code else where) + f" {h.share:.0%}")
    return f"the program's own per-sample code holds {cost.removed:.0%} of the loading time ({', '.join(parts)})"
