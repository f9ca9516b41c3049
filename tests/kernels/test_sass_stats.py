"""kernels/sass_stats.py: the main loop of a SASS listing, its instruction mix and load widths (no GPU needed)."""

from __future__ import annotations

from edgekit.kernels.sass_stats import loop_stats, main_loop

SASS = """\
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0030*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        /*0040*/                   LDG.E.U16.CONSTANT R3, desc[UR4][R6.64] ;
        /*0050*/                   HFMA2 R9, R8, R10, R9 ;
        /*0060*/                   LOP3.LUT R10, R8, 0xf000f, RZ, 0xc0, !PT ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""


def test_the_main_loop_is_the_longest_backward_branch():
    loop = main_loop(SASS)
    assert loop[0] == ".L_x_1:" and "BRA `(.L_x_1)" in loop[-1] and len(loop) == 6


def test_mix_and_load_widths(monkeypatch):
    import edgekit.kernels.sass_stats as ss

    monkeypatch.setattr(ss, "disassemble", lambda cubin: SASS)
    st = loop_stats(b"")
    assert st.instructions == 5
    assert st.mix == {"LDG": 2, "HFMA2": 1, "LOP3": 1, "BRA": 1}
    assert st.global_loads == {"128": 1, "16": 1}


def test_a_compiled_half2_gemv_loads_its_weights_16_bytes_at_a_time():
    # the real thing: Triton's compile for sm_90 and the bundled nvdisasm
    from edgekit.kernels.aot import compile_variant
    from edgekit.kernels.variants import KernelVariant

    v = KernelVariant("linear_w4a16", "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "DECODE": 3}, 2, 1)
    st = loop_stats(compile_variant(v, 90).cubin)
    per_thread_bytes = 64 * 256 // 2 // 64
    assert st.global_loads.get("128", 0) * 16 == per_thread_bytes  # every weight byte through LDG.E.128
    assert st.mix["HFMA2"] >= per_thread_bytes  # products and high-nibble decodes in half2
    assert st.instructions / per_thread_bytes < 8
