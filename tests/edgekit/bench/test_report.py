"""The bench report's confined-run table and verdict lines, rendered as a terminal would show them."""

from __future__ import annotations

from rich.console import Console

from edgekit.bench.document import PARTITION_ENGINE, BenchDocument, Roofline, Row, SmPartition, finish
from edgekit.bench.report import print_report


def _row(engine, tps, part=None, **kw):
    return Row(model="preset:smollm2-135m", precision="fp16", engine=engine, engine_label=engine, context=512,
               decode_tokens_per_s=tps, partition=part, **kw)


def test_confined_rows_get_their_own_table_and_a_verdict_on_the_orin_tiles():
    def part(tiles, launch):
        return SmPartition(requested_sms=12, confined=True, tiles=tiles, sm_count=16, observed_sms=16, device_sms=132,
                           launch_rule_sms=launch, copy_bytes_per_s=1.2e12,
                           tile_choices={"fused_attn_proj_residual/attn_split_combine": "attn_split_combine[BLOCK_N=256] w4 s2 fp16"})

    roof = Roofline(bytes_per_token=1, weight_bytes=1, kv_bytes=0, attended_len=1.0, tokens_per_s=1000.0, fraction=0.75)
    doc = BenchDocument(measured_on="gpu (NVIDIA H200)", created="now", device={}, settings={}, rows=[
        _row("edgekit-fused", 1500.0),
        _row(PARTITION_ENGINE, 750.0, part("orin-plan", 16), roofline=roof),
        _row(PARTITION_ENGINE, 700.0, part("jit-default", 16)),
        _row(PARTITION_ENGINE, None, part("orin-plan@device-sms", 132), status="failed", error="setup: boom"),
    ])
    finish(doc, {})
    console = Console(record=True, width=250)
    print_report(doc, console)
    text = console.export_text()
    assert "Orin-shaped" in text and "12 -> 16, 16 seen of 132" in text  # asked, got, probed
    assert "1,200" in text and "75%" in text and "0.50x" in text  # partition copy GB/s, roofline, vs all SMs
    assert "best orin-plan 750.0 tok/s; orin plan 1.000x of it (wins)" in text
    assert "attn_split_combine[BLOCK_N=256] w4 s2 fp16" in text
    main = text.split("Orin-shaped")[0]
    assert "edgekit fused" in main and "orin-plan" not in main  # confined rows stay out of the main table
