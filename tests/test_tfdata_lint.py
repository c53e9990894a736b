"""tf.data description (:mod:`whyidle.instrument.tfdata`) + lint (:mod:`whyidle.diagnose.rules_tfdata`)
on real, tiny pipelines: each smell and its fixed twin. Pure rule tests: tests/test_tfdata_rules.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from whyidle.diagnose.rules_tfdata import fix_code, input_cause, tfdata_smells  # noqa: E402
from whyidle.instrument.tfdata import MAX_STAGES, describe  # noqa: E402

GiB = 1 << 30
AUTOTUNE = tf.data.AUTOTUNE


def parse(x):  # stateless, cheap: 2 ops
    return tf.cast(x, tf.float32) * 2.0


def heavy(x):  # stateless, 13 ops
    y = tf.cast(x, tf.float32)
    for _ in range(6):
        y = tf.sin(y) + 1.0
    return y


def augment(x):  # stateful (RandomUniform)
    return tf.cast(x, tf.float32) + tf.random.uniform([])


def py_parse(x):
    return tf.py_function(lambda v: v * 2, [x], tf.int64)


def np_parse(x):
    return tf.numpy_function(lambda v: v * 2, [x], tf.int64)


def gen():
    for i in range(10):
        yield np.float32(i)


def lint(ds, mem=8 * GiB):
    desc = describe(ds)
    assert "error" not in desc, desc.get("error")
    json.dumps(desc)  # JSON-serializable
    return desc, tfdata_smells(desc, mem)


def of_kind(smells, kind):
    return [s for s in smells if s["kind"] == kind]


def test_sequential_map_and_fixed_twin():
    desc, smells = lint(tf.data.Dataset.range(100).map(parse).map(augment).prefetch(AUTOTUNE))
    assert [s["op"] for s in desc["stages"]] == ["range", "map", "map", "prefetch"]
    m1, m2 = desc["stages"][1], desc["stages"][2]
    assert m1["parallel"] is None and m1["cls"] == "_MapDataset" and m1["fn"] == "parse"
    assert m1["fn_site"].endswith(f"test_tfdata_lint.py:{parse.__code__.co_firstlineno}")
    assert m1["py_func"] is False and m1["stateful"] is False and m1["fn_ops"] == 2
    assert m2["stateful"] is True and m2["stateful_ops"] == ["RandomUniform"]
    seq = of_kind(smells, "sequential_map")
    assert [(s["stage"], s["auto_fixed"]) for s in seq] == [(1, True), (2, False)]
    assert seq[1]["code"] == "ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)"
    assert "RandomUniform" in seq[1]["text"]
    assert input_cause(desc) == "sequential_map"

    desc, smells = lint(tf.data.Dataset.range(100).map(parse, num_parallel_calls=AUTOTUNE, deterministic=False)
                        .map(augment, num_parallel_calls=4).prefetch(AUTOTUNE))
    assert desc["stages"][1]["parallel"] == -1 and desc["stages"][1]["cls"] == "_ParallelMapDataset"
    assert desc["stages"][1]["deterministic"] is False
    assert desc["stages"][2]["parallel"] == 4
    assert smells == [] and input_cause(desc) is None and fix_code(desc) == ""


def test_no_prefetch_and_fixed_twin():
    desc, smells = lint(tf.data.Dataset.range(100).batch(4))
    assert [(s["kind"], s["stage"], s["auto_fixed"]) for s in smells] == [("no_prefetch", 1, True)]
    assert smells[0]["code"] == "ds = ds.prefetch(tf.data.AUTOTUNE)"
    assert "inject_prefetch" in smells[0]["text"]
    assert input_cause(desc) is None  # TF 2.21 injects the prefetch itself

    opts = tf.data.Options()
    opts.autotune.enabled = False
    desc, smells = lint(tf.data.Dataset.range(100).batch(4).with_options(opts))
    assert desc["options"]["autotune"] is False and desc["options"]["inject_prefetch"] is True
    assert [(s["kind"], s["stage"], s["auto_fixed"]) for s in smells] == [("no_prefetch", 1, False)]
    assert input_cause(desc) == "no_prefetch"

    desc, smells = lint(tf.data.Dataset.range(100).batch(4).prefetch(AUTOTUNE))
    assert desc["stages"][-1]["buffer"] == -1 and not of_kind(smells, "no_prefetch")
    desc, smells = lint(tf.data.Dataset.range(100).batch(4).prefetch(2).repeat())
    assert desc["stages"][2]["buffer"] == 2 and not of_kind(smells, "no_prefetch")


@pytest.mark.parametrize("fn", [py_parse, np_parse])
def test_py_function_map_and_fixed_twin(fn):
    desc, smells = lint(tf.data.Dataset.range(100).map(fn, num_parallel_calls=AUTOTUNE).prefetch(1))
    st = desc["stages"][1]
    assert st["py_func"] is True and st["parallel"] == -1 and st["fn"] == fn.__name__
    assert [(s["kind"], s["stage"]) for s in smells] == [("py_function_map", 1)]
    assert smells[0]["code"].startswith(f"ds = ds.map({fn.__name__}, num_parallel_calls=tf.data.AUTOTUNE)  # rewrite")
    assert input_cause(desc) == "python_in_pipeline"

    desc, smells = lint(tf.data.Dataset.range(100).map(parse, num_parallel_calls=AUTOTUNE).prefetch(1))
    assert desc["stages"][1]["py_func"] is False and not of_kind(smells, "py_function_map")


def test_generator_source_and_fixed_twin():
    ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.float32)).batch(5)
    desc, smells = lint(ds.prefetch(AUTOTUNE))
    assert [s["op"] for s in desc["stages"]] == ["generator", "batch", "prefetch"]  # from_tensors(0) dummy hidden
    src = desc["stages"][0]
    assert src["cls"] == "_FlatMapDataset" and src["py_func"] is True and src["fn"] == "gen"
    assert src["fn_site"].endswith(f"test_tfdata_lint.py:{gen.__code__.co_firstlineno}")
    assert desc["cardinality"] == -2 and desc["source_elements"] is None
    assert desc["batch_size"] == 5 and desc["element_bytes"] == 4
    assert [(s["kind"], s["stage"]) for s in smells] == [("generator_source", 0)]
    assert "from_generator(gen)" in smells[0]["code"]
    assert input_cause(desc) == "python_in_pipeline"

    # the legacy output_types form builds the same structure
    legacy = describe(tf.data.Dataset.from_generator(gen, output_types=tf.float32, output_shapes=()))
    assert legacy["stages"][0]["op"] == "generator" and legacy["stages"][0]["fn"] == "gen"

    desc, smells = lint(tf.data.Dataset.from_tensor_slices(np.arange(10, dtype=np.float32)).batch(5).prefetch(1))
    assert desc["stages"][0]["op"] == "tensor_slices" and desc["source_elements"] == 10
    assert smells == []


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    paths = []
    for k in range(3):
        p = str(d / f"part{k}.tfrecord")
        with tf.io.TFRecordWriter(p) as w:
            for i in range(4):
                w.write(bytes([i]) * 8)
        paths.append(p)
    return paths


def test_sequential_interleave_and_fixed_twin(tfrecords):
    files = tf.data.Dataset.from_tensor_slices(tfrecords)
    desc, smells = lint(files.interleave(tf.data.TFRecordDataset, cycle_length=2).prefetch(1))
    assert [s["op"] for s in desc["stages"]] == ["files", "interleave", "prefetch"]
    st = desc["stages"][1]
    assert st["parallel"] is None and st["cycle_length"] == 2 and "TFRecordDataset" in st["io_ops"]
    assert [(s["kind"], s["stage"]) for s in smells] == [("sequential_interleave", 1)]
    assert smells[0]["code"] == ("ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=2, "
                                 "num_parallel_calls=tf.data.AUTOTUNE)")
    assert "3 files" in smells[0]["text"]
    assert input_cause(desc) == "sequential_interleave"

    desc, smells = lint(files.interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=AUTOTUNE)
                        .prefetch(1))
    assert desc["stages"][1]["parallel"] == -1 and smells == []

    # the reader's own num_parallel_reads, and list_files (shuffled file names) as the source
    desc, smells = lint(tf.data.TFRecordDataset(tfrecords).prefetch(1))
    assert [s["op"] for s in desc["stages"]] == ["files", "tfrecord", "prefetch"]
    assert [(s["kind"], s["stage"]) for s in smells] == [("sequential_interleave", 1)]
    assert smells[0]["code"] == "ds = tf.data.TFRecordDataset(filenames, num_parallel_reads=tf.data.AUTOTUNE)"
    desc, smells = lint(tf.data.TFRecordDataset(tfrecords, num_parallel_reads=2).prefetch(1))
    assert desc["stages"][1]["parallel"] == 2 and smells == []
    pattern = os.path.join(os.path.dirname(tfrecords[0]), "*.tfrecord")
    desc = describe(tf.data.Dataset.list_files(pattern).interleave(tf.data.TFRecordDataset))
    assert [s["op"] for s in desc["stages"]] == ["files", "shuffle", "interleave"]
    assert desc["stages"][1]["buffer"] == 3


def test_no_cache_and_fixed_twin():
    desc, smells = lint(tf.data.Dataset.range(1000).map(heavy).shuffle(1000).batch(10).prefetch(1))
    assert desc["stages"][1]["fn_ops"] == 13 and desc["stages"][1]["elem_bytes"] == 4
    assert [(s["kind"], s["stage"]) for s in of_kind(smells, "no_cache")] == [("no_cache", 1)]
    assert of_kind(smells, "no_cache")[0]["code"] == "ds = ds.map(heavy, num_parallel_calls=tf.data.AUTOTUNE).cache()"
    assert "1,000 elements" in of_kind(smells, "no_cache")[0]["text"]
    assert tfdata_smells(desc, None) and not of_kind(tfdata_smells(desc, None), "no_cache")  # RAM unknown: silent

    desc, smells = lint(tf.data.Dataset.range(1000).map(heavy).cache().shuffle(1000).batch(10).prefetch(1))
    assert desc["stages"][2]["cache_file"] == "" and not of_kind(smells, "no_cache")
    # random (stateful) work must not be cached
    _, smells = lint(tf.data.Dataset.range(1000).map(lambda x: heavy(x) + tf.random.uniform([])).batch(10))
    assert not of_kind(smells, "no_cache")


def test_map_before_batch_and_fixed_twin():
    desc, smells = lint(tf.data.Dataset.range(100).map(heavy, num_parallel_calls=AUTOTUNE).batch(10).prefetch(1))
    assert desc["batch_size"] == 10 and desc["stages"][2]["batch_size"] == 10
    assert desc["stages"][2]["drop_remainder"] is False
    mbb = of_kind(smells, "map_before_batch")
    assert [(s["stage"]) for s in mbb] == [1]
    assert mbb[0]["code"].startswith("ds = ds.batch(10).map(heavy_batched, num_parallel_calls=tf.data.AUTOTUNE)")
    assert "ds = ds.batch(10).map(heavy_batched" in fix_code(desc, 8 * GiB)

    desc, smells = lint(tf.data.Dataset.range(100).batch(10).map(heavy, num_parallel_calls=AUTOTUNE).prefetch(1))
    assert not of_kind(smells, "map_before_batch")


def test_tiny_shuffle_and_fixed_twin():
    desc, smells = lint(tf.data.Dataset.range(10_000).shuffle(10).batch(100).prefetch(1))
    assert desc["stages"][1]["buffer"] == 10
    ts = of_kind(smells, "tiny_shuffle")
    assert [s["stage"] for s in ts] == [1] and ts[0]["code"] == "ds = ds.shuffle(10000)"
    desc, smells = lint(tf.data.Dataset.range(10_000).shuffle(10_000).batch(100).prefetch(1))
    assert not of_kind(smells, "tiny_shuffle")
    # after repeat(): the buffer is compared with what is repeated
    _, smells = lint(tf.data.Dataset.range(10_000).repeat().shuffle(10).batch(100).prefetch(1))
    assert [s["stage"] for s in of_kind(smells, "tiny_shuffle")] == [2]


def test_describe_zip_options_repeat_and_sizes():
    zipped = tf.data.Dataset.zip((tf.data.Dataset.range(5), tf.data.Dataset.range(7).map(parse)))
    desc = describe(zipped)
    assert [s["op"] for s in desc["stages"]] == ["range", "zip"] and desc["stages"][1]["branches"] == 1
    assert desc["cardinality"] == 5 and desc["element_bytes"] == 12

    opts = tf.data.Options()
    opts.experimental_optimization.map_parallelization = False
    opts.deterministic = False
    desc = describe(tf.data.Dataset.range(10).map(parse).with_options(opts).repeat())
    assert [s["op"] for s in desc["stages"]] == ["range", "map", "options", "repeat"]
    assert desc["stages"][3]["count"] == -1 and desc["cardinality"] == -1 and desc["source_elements"] == 10
    assert desc["options"]["map_parallelization"] is False and desc["options"]["deterministic"] is False
    assert desc["options"]["autotune"] is True
    seq = of_kind(tfdata_smells(desc), "sequential_map")
    assert seq and seq[0]["auto_fixed"] is False and "map_parallelization" in seq[0]["text"]

    images = np.zeros((50, 28, 28), np.float32)
    desc = describe(tf.data.Dataset.from_tensor_slices((images, np.zeros(50, np.int64))).batch(10))
    assert desc["batch_size"] == 10 and desc["element_bytes"] == 28 * 28 * 4 + 8
    assert desc["stages"][0]["elem_bytes"] == 28 * 28 * 4 + 8 and desc["stages"][1]["elem_bytes"] is None
    assert desc["tf_version"] == tf.__version__


def test_describe_is_bounded_and_never_raises():
    ds = tf.data.Dataset.range(10)
    for _ in range(MAX_STAGES + 6):
        ds = ds.take(10)
    desc = describe(ds)
    assert desc["truncated"] is True and len(desc["stages"]) == MAX_STAGES and desc["source_elements"] is None

    for broken in (object(), None, "not a dataset"):
        desc = describe(broken)
        assert desc["error"] and desc["stages"] == []
        assert tfdata_smells(desc) == [] and input_cause(desc) is None and fix_code(desc) == ""

    class Weird(tf.data.Dataset):  # a Dataset subclass whose graph walk blows up
        def __init__(self):
            pass

        def _inputs(self):
            raise RuntimeError("boom")

        @property
        def element_spec(self):
            raise RuntimeError("no spec")

    desc = describe(Weird())
    assert "RuntimeError" in desc["error"] and desc["stages"] == []

    # a failure half-way keeps the stages read so far, nearest the sink
    ds = tf.data.Dataset.range(10).batch(2).prefetch(1)
    ds._input_dataset._input_dataset = Weird()
    desc = describe(ds)
    assert "no spec" in desc["error"] and [s["op"] for s in desc["stages"]] == ["batch", "prefetch"]
    assert desc["truncated"] is True and desc["source_elements"] is None
