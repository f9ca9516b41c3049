"""The suite's own settings that CI depends on."""

from __future__ import annotations


def test_a_passing_tests_tmp_folder_is_not_kept(request):
    # pytest's default keeps every test's tmp_path for three sessions: ~7 GB a run here (the published-shape parity
    # tests write 0.7-2.3 GB each), which filled a CI machine's disk that keeps /tmp between runs
    assert request.config.getini("tmp_path_retention_policy") == "failed"
