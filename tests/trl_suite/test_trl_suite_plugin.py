"""`trl_suite_plugin.stock_config`: the stock side of TRL's suite trains in the precision this CPU chooses where a
TRL test leaves `bf16` unset, and as the test says where it sets it. `use_cpu=True` as TRL's suite forces it on a
machine without an accelerator (its conftest's `force_use_cpu_without_accelerator`)."""

import pytest
import trl_suite_plugin


@pytest.mark.parametrize("bf16_native", [True, False])
def test_an_unset_bf16_is_this_cpus_choice_as_for_the_minimind_config(tmp_path, cpu_machine, bf16_native):
    from minimind_trl.trainer import MiniMindGRPOConfig

    cpu_machine(bf16_native)
    stock = trl_suite_plugin.stock_config(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    minimind = MiniMindGRPOConfig.trl_defaults(output_dir=str(tmp_path), report_to="none")
    assert stock.bf16 is bf16_native and minimind.bf16 is bf16_native


@pytest.mark.parametrize("bf16", [True, False])
def test_a_bf16_the_test_sets_is_kept(tmp_path, cpu_machine, bf16):
    cpu_machine(not bf16)
    config = trl_suite_plugin.stock_config(output_dir=str(tmp_path), bf16=bf16, report_to="none", use_cpu=True)
    assert config.bf16 is bf16
