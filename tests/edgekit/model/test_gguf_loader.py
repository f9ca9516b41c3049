"""The GGUF header as edgekit parses it (metadata arrays in bulk) is the header gguf's own reader parses, and it is
parsed many times faster (a 262k-token vocabulary took 18 s element by element)."""

from __future__ import annotations

import time

import gguf
import numpy as np
import pytest

from edgekit.model.gguf_loader import _bulk_array_reader
from edgekit.model.loader import default_model_path


def _write(path, endianess, tokens: int = 300):
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    w.add_token_list(["", "a", "héllo ☃", *(f"<t{i}>" for i in range(tokens - 3))])  # empty and multibyte strings
    w.add_token_types([1, 3, 1, *([1] * (tokens - 3))])
    w.add_token_scores([0.5 * i for i in range(tokens)])
    w.add_token_merges([])  # an empty array: no element type in the field's types
    w.add_array("test.bools", [True, False, True])
    w.add_key_value("test.int64s", [-(2**40), 0, 2**40], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT64)
    w.add_array("test.nested", [[1, 2], [3]])  # arrays of arrays: the stock path, element by element
    w.add_uint32("test.scalar", 7)
    w.add_string("test.string", "a string")
    w.add_tensor("t.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same_fields(got, want) -> None:
    assert list(got.fields) == list(want.fields)
    for name, f in want.fields.items():
        g = got.fields[name]
        assert (g.offset, g.name, g.data, g.types) == (f.offset, f.name, f.data, f.types), name
        assert [p.tobytes() for p in g.parts] == [p.tobytes() for p in f.parts], name
        assert [p.dtype for p in g.parts] == [p.dtype for p in f.parts], name
        assert g.contents() == f.contents(), name
    assert [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset, t.data.tobytes()) for t in got.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset, t.data.tobytes()) for t in want.tensors]


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_metadata_type_parses_as_ggufs_own_reader_parses_it(tmp_path, endianess):
    path = _write(tmp_path / "m.gguf", endianess)
    got, want = _bulk_array_reader()(str(path)), gguf.GGUFReader(str(path))
    _same_fields(got, want)
    assert got.fields["tokenizer.ggml.tokens"].contents()[:3] == ["", "a", "héllo ☃"]
    assert got.fields["test.int64s"].contents() == [-(2**40), 0, 2**40]


@pytest.mark.serial  # times a refusal / a parse: run alone (scripts/test.sh)
def test_the_default_models_header_parses_as_ggufs_own_reader_parses_it_at_least_5x_faster():
    path = str(default_model_path())  # 49k tokens: 2.2 s element by element, 0.12 s in bulk on an idle core

    def timed(reader):
        t = time.perf_counter()
        return reader(path), time.perf_counter() - t

    (want, stock), (got, bulk) = timed(gguf.GGUFReader), timed(_bulk_array_reader())
    _same_fields(got, want)
    assert bulk * 5 <= stock, f"bulk {bulk:.2f} s, element by element {stock:.2f} s"
