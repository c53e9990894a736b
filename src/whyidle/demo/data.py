"""The demo's image folder: JPEG crops cut from the photographs scikit-learn ships.

``sklearn.datasets.load_sample_images()`` holds two real 427×640 photos (``china.jpg``,
``flower.jpg``). We cut square crops of random size and position from each, downscale them to
:data:`CROP_SIZE`, and save them as JPEG files in an ImageFolder layout (``<root>/<class>/*.jpg``,
one class per source photo), so that training has to open, decode and augment real JPEG files per
sample, exactly like a beginner's image pipeline.
"""

from __future__ import annotations

import os
import random

#: Version of the folder layout; a folder made by another version is rebuilt.
LAYOUT = "whyidle-demo-images/1"
CROPS_PER_PHOTO = 400
CROP_SIZE = 320
JPEG_QUALITY = 90


def default_dir() -> str:
    """``$XDG_CACHE_HOME/whyidle/demo-images`` (``~/.cache/...`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "whyidle", "demo-images")


def ensure_images(root: str | None = None, seed: int = 0) -> tuple[str, int]:
    """Creates the image folder on first use; returns ``(root, number_of_images)``.

    Errors: ``ImportError`` when scikit-learn or Pillow is missing (install ``whyidle[demo]``);
    ``OSError`` when ``root`` cannot be written.
    """
    root = root or default_dir()
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            parts = f.read().split()
        if parts and parts[0] == LAYOUT:
            return root, int(parts[1])
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    rng = random.Random(seed)
    count = 0
    for path, array in zip(photos.filenames, photos.images):
        label = os.path.splitext(os.path.basename(path))[0]
        os.makedirs(os.path.join(root, label), exist_ok=True)
        image = Image.fromarray(array)
        height, width = array.shape[:2]
        for i in range(CROPS_PER_PHOTO):
            side = rng.randint(min(height, width) // 3, min(height, width))
            left = rng.randint(0, width - side)
            top = rng.randint(0, height - side)
            crop = image.crop((left, top, left + side, top + side)).resize((CROP_SIZE, CROP_SIZE), Image.BILINEAR)
            crop.save(os.path.join(root, label, f"{i:04d}.jpg"), quality=JPEG_QUALITY)
            count += 1
    with open(marker, "w", encoding="utf-8") as f:
        f.write(f"{LAYOUT} {count}\n")
    return root, count
