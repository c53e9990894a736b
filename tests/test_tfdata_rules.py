"""Pure tests of the tf.data lint (:mod:`whyidle.diagnose.rules_tfdata`) on hand-written pipeline
descriptions (the dict of :func:`whyidle.instrument.tfdata.describe`); no TensorFlow needed."""

from __future__ import annotations

from whyidle.diagnose import rules_tfdata as R
from whyidle.diagnose.rules_tfdata import fix_code, input_cause, tfdata_smells

GiB = 1 << 30


def stage(op, **kw):
    base = {"op": op, "cls": "_" + op.title() + "Dataset", "parallel": None, "buffer": None, "batch_size": None,
            "deterministic": None, "cache_file": None, "cardinality": None, "elem_bytes": None}
    if op in ("map", "filter", "interleave", "flat_map", "generator"):
        base.update(fn="parse", fn_site="/home/u/train.py:12", py_func=False, fn_ops=3, stateful=False,
                    stateful_ops=[], io_ops=[])
    base.update(kw)
    return base


def pipe(*stages, **kw):
    out = {"stages": list(stages), "cardinality": None, "batch_size": None, "element_bytes": None,
           "source_elements": None, "options": {}, "tf_version": "2.21.0", "truncated": False}
    out.update(kw)
    return out


def kinds(smells):
    return [(s["kind"], s["stage"]) for s in smells]


def test_module_is_pure():
    assert "tensorflow" not in R.__dict__
    src = open(R.__file__).read()
    assert "import tensorflow" not in src and "from tensorflow" not in src


def test_every_smell_has_the_contract_keys():
    p = pipe(stage("generator", fn="gen", py_func=True, fn_ops=None),
             stage("map", py_func=True, fn="load"),
             stage("shuffle", buffer=2, cardinality=1000),
             stage("batch", batch_size=8),
             options={"autotune": False})
    p["stages"][1]["cardinality"] = 1000
    smells = tfdata_smells(p, 8 * GiB)
    assert {s["kind"] for s in smells} >= {"generator_source", "py_function_map", "sequential_map", "no_prefetch"}
    for s in smells:
        assert set(s) == {"kind", "stage", "text", "code", "docs", "auto_fixed"}
        assert s["text"].endswith(".") and s["code"].startswith("ds = ")
        assert s["docs"] and all(d.startswith("https://") for d in s["docs"])
        assert 0 <= s["stage"] < len(p["stages"])
    order = [R.KIND_ORDER.index(s["kind"]) for s in smells]
    assert order == sorted(order)


def test_sequential_map_auto_fixed_depends_on_statefulness_and_options():
    p = pipe(stage("range", cardinality=100), stage("map", fn_ops=2), stage("prefetch", buffer=-1))
    (s,) = tfdata_smells(p)
    assert (s["kind"], s["stage"], s["auto_fixed"]) == ("sequential_map", 1, True)
    assert s["code"] == "ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)"
    assert "train.py:12" in s["text"] and "2 ops" in s["text"]
    assert input_cause(p) is None

    p["stages"][1].update(stateful=True, stateful_ops=["RandomUniform"])
    (s,) = tfdata_smells(p)
    assert s["auto_fixed"] is False and "RandomUniform" in s["text"]
    assert input_cause(p) == "sequential_map"

    p["stages"][1].update(stateful=False)
    p["options"] = {"map_parallelization": False}
    assert tfdata_smells(p)[0]["auto_fixed"] is False and input_cause(p) == "sequential_map"

    p["options"] = {}
    p["stages"][1]["parallel"] = 1  # explicit single call: TF does not rewrite it
    (s,) = tfdata_smells(p)
    assert s["auto_fixed"] is False and "num_parallel_calls=1" in s["text"]

    p["stages"][1]["parallel"] = -1
    assert tfdata_smells(p) == [] and fix_code(p) == ""


def test_lambda_name_is_not_written_as_code():
    p = pipe(stage("range"), stage("map", fn="<lambda>", fn_site="/x/t.py:3"), stage("prefetch"))
    (s,) = tfdata_smells(p)
    assert s["code"] == "ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)  # fn = the <lambda> at t.py:3"
    assert fix_code(p) == s["code"]
    p["stages"][1]["py_func"] = True
    assert tfdata_smells(p)[0]["code"] == (
        "ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)  # rewrite fn with TensorFlow ops "
        "(tf.io.read_file, tf.io.decode_image, tf.image.*); fn = the <lambda> at t.py:3")
    assert fix_code(p) == ("ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)  # fn = the <lambda> at t.py:3; "
                           "rewrite fn with TensorFlow ops instead of tf.py_function")


def test_no_prefetch_variants():
    sync = pipe(stage("range"), stage("batch", batch_size=4))
    (s,) = tfdata_smells(sync)
    assert (s["kind"], s["stage"], s["auto_fixed"]) == ("no_prefetch", 1, True)
    assert input_cause(sync) is None
    for opts in ({"autotune": False}, {"inject_prefetch": False}):
        sync["options"] = opts
        (s,) = tfdata_smells(sync)
        assert s["auto_fixed"] is False and input_cause(sync) == "no_prefetch"
        assert s["code"] == "ds = ds.prefetch(tf.data.AUTOTUNE)"
    # an asynchronous last stage runs ahead by itself, even with autotuning off
    fused = pipe(stage("range"), stage("map", parallel=-1), stage("batch", batch_size=4), options={"autotune": False})
    (s,) = tfdata_smells(fused)
    assert s["kind"] == "no_prefetch" and s["auto_fixed"] is True and "MapAndBatch" in s["text"]
    par = pipe(stage("range"), stage("map", parallel=4), options={"autotune": False})
    assert tfdata_smells(par)[0]["auto_fixed"] is True
    # a prefetch under trailing repeat / options / take is still last
    ok = pipe(stage("range"), stage("batch", batch_size=4), stage("prefetch", buffer=2), stage("repeat", count=-1),
              stage("options"))
    assert tfdata_smells(ok) == []


def test_python_in_pipeline_wins():
    p = pipe(stage("range", cardinality=10), stage("map", py_func=True, parallel=-1, stateful=False),
             stage("batch", batch_size=2), stage("prefetch"))
    assert kinds(tfdata_smells(p)) == [("py_function_map", 1)]
    assert "AUTOTUNE parallel calls" in tfdata_smells(p)[0]["text"]
    assert input_cause(p) == "python_in_pipeline"
    p["stages"][1]["parallel"] = None
    assert kinds(tfdata_smells(p)) == [("py_function_map", 1), ("sequential_map", 1)]
    assert input_cause(p) == "python_in_pipeline"
    assert fix_code(p) == ("ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)"
                           "  # rewrite parse with TensorFlow ops instead of tf.py_function")

    g = pipe(stage("generator", fn="gen", py_func=True, fn_ops=None), stage("prefetch"))
    assert kinds(tfdata_smells(g)) == [("generator_source", 0)]
    assert input_cause(g) == "python_in_pipeline"
    assert "from_generator(gen)" in fix_code(g)


def test_sequential_interleave():
    files = stage("files", cardinality=16)
    p = pipe(files, stage("interleave", fn="read", io_ops=["TFRecordDataset"], cycle_length=4), stage("prefetch"))
    (s,) = tfdata_smells(p)
    assert (s["kind"], s["stage"]) == ("sequential_interleave", 1) and "16 files" in s["text"]
    assert s["code"] == "ds = ds.interleave(read, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)"
    assert input_cause(p) == "sequential_interleave"
    p["stages"][1]["parallel"] = -1
    assert tfdata_smells(p) == []
    # flat_map over files, reader without num_parallel_reads
    fm = pipe(files, stage("flat_map", fn="TFRecordDatasetV2", io_ops=["TFRecordDataset"]), stage("prefetch"))
    assert tfdata_smells(fm)[0]["code"] == "ds = ds.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)"
    rd = pipe(files, stage("tfrecord"), stage("prefetch"))
    assert kinds(tfdata_smells(rd)) == [("sequential_interleave", 1)]
    # an interleave that reads nothing, or a single file: nothing to say
    assert tfdata_smells(pipe(stage("range"), stage("interleave"), stage("prefetch"))) == []
    assert tfdata_smells(pipe(stage("files", cardinality=1), stage("tfrecord"), stage("prefetch"))) == []


def test_no_cache():
    def build(**map_kw):
        m = stage("map", **{"parallel": -1, "fn_ops": 25, "cardinality": 50_000, "elem_bytes": 150_528, **map_kw})
        return pipe(stage("files", cardinality=50_000), m, stage("shuffle", buffer=50_000, cardinality=50_000),
                    stage("batch", batch_size=32), stage("prefetch"), source_elements=50_000)

    p = build()  # 50,000 × 150.5 kB = 7.5 GB
    (s,) = tfdata_smells(p, 64 * GiB)
    assert (s["kind"], s["stage"]) == ("no_cache", 1)
    assert s["code"] == "ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).cache()"
    assert "50,000 elements" in s["text"] and "7.5 GB" in s["text"] and "before the shuffle" in s["text"]
    assert fix_code(p, 64 * GiB) == s["code"]
    assert tfdata_smells(p, 16 * GiB) == []  # 7.5 GB ≥ 25 % of 16 GiB
    assert tfdata_smells(p, None) == []  # RAM unknown
    assert tfdata_smells(build(stateful=True, stateful_ops=["RandomUniform"]), 64 * GiB) == []
    assert tfdata_smells(build(fn_ops=3), 64 * GiB) == []  # cheap
    assert kinds(tfdata_smells(build(fn_ops=3, io_ops=["DecodeJpeg", "ReadFile"]), 64 * GiB)) == [("no_cache", 1)]
    cached = build()
    cached["stages"].insert(2, stage("cache", cache_file=""))
    assert tfdata_smells(cached, 64 * GiB) == []
    unknown = build(elem_bytes=None)
    assert tfdata_smells(unknown, 64 * GiB) == []


def test_map_before_batch():
    p = pipe(stage("range", elem_bytes=8), stage("map", parallel=-1, fn_ops=40), stage("batch", batch_size=64),
             stage("prefetch"))
    (s,) = tfdata_smells(p)
    assert (s["kind"], s["stage"]) == ("map_before_batch", 1) and "40 ops" in s["text"] and "batch(64)" in s["text"]
    assert fix_code(p) == ("ds = ds.batch(64).map(parse_batched, num_parallel_calls=tf.data.AUTOTUNE)"
                           "  # parse_batched: parse written for a leading batch dimension")
    for change in ({"fn_ops": 5}, {"py_func": True}, {"io_ops": ["DecodeJpeg"]}):
        q = pipe(*[dict(st) for st in p["stages"]])
        q["stages"][1].update(change)
        assert not [x for x in tfdata_smells(q) if x["kind"] == "map_before_batch"]
    q = pipe(*[dict(st) for st in p["stages"]])
    q["stages"][0]["elem_bytes"] = None  # variable input shapes cannot be batched first
    assert tfdata_smells(q) == []


def test_tiny_shuffle():
    p = pipe(stage("range", cardinality=100_000), stage("shuffle", buffer=100, cardinality=100_000, elem_bytes=3072),
             stage("batch", batch_size=32), stage("prefetch"))
    (s,) = tfdata_smells(p, 8 * GiB)
    assert (s["kind"], s["stage"]) == ("tiny_shuffle", 1) and "0.10%" in s["text"]
    assert s["code"] == "ds = ds.shuffle(100000)"
    small_ram = tfdata_smells(p, 100 * 3072 * 20)  # 10 % of RAM holds 200 elements
    assert small_ram[0]["code"] == "ds = ds.shuffle(200)"
    p["stages"][1]["elem_bytes"] = None
    assert tfdata_smells(p)[0]["code"] == f"ds = ds.shuffle({R.SHUFFLE_FALLBACK_BUFFER})"
    p["stages"][1]["buffer"] = 1000  # 1 %: not tiny
    assert tfdata_smells(p) == []


def test_fix_code_merges_one_line_per_stage():
    p = pipe(stage("range", cardinality=1000, elem_bytes=8),
             stage("map", fn="decode", fn_ops=30, cardinality=1000, elem_bytes=4096),
             stage("shuffle", buffer=4, cardinality=1000, elem_bytes=4096),
             stage("map", fn="augment", stateful=True, stateful_ops=["RandomUniform"], fn_ops=4),
             stage("batch", batch_size=32), source_elements=1000)
    assert kinds(tfdata_smells(p, 8 * GiB)) == [("sequential_map", 1), ("sequential_map", 3), ("no_prefetch", 4),
                                              ("no_cache", 1), ("tiny_shuffle", 2)]
    assert fix_code(p, 8 * GiB) == "\n".join([
        "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()",
        "ds = ds.shuffle(1000)",
        "ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)",
        "ds = ds.prefetch(tf.data.AUTOTUNE)",
    ])
    assert input_cause(p) == "sequential_map"


def test_missing_and_broken_input():
    for bad in (None, {}, {"stages": []}, {"error": "TypeError('x')", "stages": []}, {"stages": None}):
        assert tfdata_smells(bad) == [] and input_cause(bad) is None and fix_code(bad) == ""
    # stages with only an op: unknown facts keep smells quiet, nothing raises
    p = {"stages": [{"op": "range"}, {"op": "map"}, {"op": "shuffle"}, {"op": "batch"}]}
    smells = tfdata_smells(p, 8 * GiB)
    assert {s["kind"] for s in smells} <= {"sequential_map", "no_prefetch"}
    assert [s["auto_fixed"] for s in smells if s["kind"] == "sequential_map"] == [False]  # statefulness unknown
