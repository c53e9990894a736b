"""The GPU capability table (whyidle.analysis.capability)."""

from __future__ import annotations

import pytest

from whyidle.analysis import capability as C


@pytest.mark.parametrize("cc, arch, tc, dtypes", [
    ("6.1", "Pascal", False, ()),                                        # GTX 1070
    ("7.0", "Volta", True, ("fp16",)),                                   # V100
    ("7.5", "Turing", True, ("fp16",)),                                  # T4
    ("8.0", "Ampere", True, ("fp16", "bf16", "tf32")),                   # A100
    ("8.6", "Ampere", True, ("fp16", "bf16", "tf32")),                   # RTX 3090
    ("8.9", "Ada", True, ("fp16", "bf16", "tf32", "fp8")),               # L4, RTX 4090
    ("9.0", "Hopper", True, ("fp16", "bf16", "tf32", "fp8")),            # H100, H200
    ("10.0", "Blackwell", True, ("fp16", "bf16", "tf32", "fp8", "fp4")),  # B200
    ("12.0", "Blackwell", True, ("fp16", "bf16", "tf32", "fp8", "fp4")),  # RTX 50xx
])
def test_example_cards(cc, arch, tc, dtypes):
    row = C.capability_of(cc)
    assert row["arch"] == arch
    assert row["tensor_cores"] is tc
    assert tuple(row["tensor_core_dtypes"]) == dtypes
    assert row["exact"] is True and row["cc"] == cc and row["table_cc"] == cc
    assert C.has_tensor_cores(cc) is tc


def test_every_architecture_and_rule_of_the_table():
    archs = {row["arch"] for row in C.CAPABILITIES.values()}
    assert archs == {"Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell"}
    assert min(C.CAPABILITIES) == (3, 5)
    for key, row in C.CAPABILITIES.items():
        d = set(row["tensor_core_dtypes"])
        assert row["tensor_cores"] == (key >= (7, 0))
        assert ("fp16" in d) == (key >= (7, 0))
        assert ("bf16" in d) == ("tf32" in d) == (key >= (8, 0))
        assert ("fp8" in d) == (key >= (8, 9))
        assert ("fp4" in d) == (key >= (10, 0))
        # conservative math factor: 1 without tensor cores, at most 2× with them
        assert row["amp_speedup"] == 1.0 if key < (7, 0) else 1.5 <= row["amp_speedup"] <= 2.0
        assert (row["amp_speedup_over_tf32"] is None) == (key < (8, 0))
        assert row["fp16_note"]


def test_pascal_note_says_mixed_precision_will_not_help():
    row = C.capability_of("6.1")
    assert "1/64" in row["fp16_note"] and "will not help" in row["fp16_note"]
    assert row["amp_speedup"] == 1.0
    assert C.amp_dtype("6.1") is None


def test_accepts_strings_tuples_and_lists():
    assert C.capability_of((8, 6))["cc"] == "8.6"
    assert C.capability_of([9, 0])["arch"] == "Hopper"
    assert C.capability_of("8.6.0")["cc"] == "8.6"
    assert C.capability_of(" 7.5 ")["arch"] == "Turing"
    assert C.parse_cc("9") == (9, 0)


@pytest.mark.parametrize("bad", [None, "", "abc", "x.y", (8,), 8.6, {"major": 8}])
def test_unknown_input_is_none(bad):
    assert C.capability_of(bad) is None
    assert C.has_tensor_cores(bad) is False
    assert C.supports_bf16(bad) is False
    assert C.amp_dtype(bad) is None


def test_unknown_minor_falls_back_to_the_majors_row():
    row = C.capability_of("8.8")
    assert row["arch"] == "Ampere" and row["table_cc"] == "8.0" and row["cc"] == "8.8"
    assert row["exact"] is False
    assert row["amp_speedup"] == 1.5 and row["amp_speedup_over_tf32"] == 1.5  # smallest of the 8.x rows
    assert row["mig"] is False
    assert C.capability_of("7.9")["table_cc"] == "7.0"
    assert C.capability_of("3.0")["arch"] == "Kepler"
    assert C.capability_of((12, 7))["arch"] == "Blackwell"


def test_unknown_major_is_none():
    assert C.capability_of("2.1") is None   # Fermi: older than the table
    assert C.capability_of("13.0") is None  # newer than the table


def test_helpers():
    assert C.supports_fp16("7.0") and not C.supports_bf16("7.0") and not C.supports_tf32("7.5")
    assert C.supports_bf16("8.0") and C.supports_tf32("8.6") and not C.supports_fp8("8.6")
    assert C.supports_fp8("8.9") and C.supports_fp8((9, 0)) and not C.supports_fp4("9.0")
    assert C.supports_fp4("10.0") and C.supports_fp4("12.0")
    assert C.amp_dtype("7.0") == "float16" and C.amp_dtype("7.5") == "float16"
    assert C.amp_dtype("8.0") == "bfloat16" and C.amp_dtype("9.0") == "bfloat16"
    assert not C.has_tensor_cores(None)


def test_turing_parts_without_tensor_cores():
    assert C.has_tensor_cores("7.5", "Tesla T4")
    assert C.has_tensor_cores("7.5", "NVIDIA GeForce RTX 2080 Ti")
    for name in ("NVIDIA GeForce GTX 1660 SUPER", "NVIDIA GeForce GTX 1650", "NVIDIA T1000 8GB", "Quadro T2000",
                 "NVIDIA GeForce MX450"):
        row = C.capability_of("7.5", name)
        assert row["tensor_cores"] is False and row["tensor_core_dtypes"] == () and row["amp_speedup"] == 1.0, name
        assert C.amp_dtype("7.5", name) is None
    # the name only matters for 7.5
    assert C.has_tensor_cores("8.6", "GTX 1660")


def test_mig_and_table_is_not_mutated():
    assert C.capability_of("8.0")["mig"] and C.capability_of("9.0")["mig"] and not C.capability_of("8.6")["mig"]
    row = C.capability_of("7.5", "GTX 1660")
    row["arch"] = "changed"
    assert C.CAPABILITIES[(7, 5)]["tensor_cores"] is True
    assert C.CAPABILITIES[(7, 5)]["arch"] == "Turing"
