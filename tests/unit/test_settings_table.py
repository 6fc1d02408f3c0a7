"""`engramd serve`'s settings table and ServeConfig describe the same settings, with the same defaults."""
from __future__ import annotations

from dataclasses import fields

from engramd.daemon.config import ServeConfig
from engramd.cli.settings import SETTINGS, serve_config


def test_every_config_field_has_exactly_one_setting():
    config_fields = sorted(f.name for f in fields(ServeConfig) if f.init)
    set_by = sorted(setting.field for setting in SETTINGS if setting.field)
    assert set_by == config_fields


def test_a_setting_default_is_the_config_default(tmp_path):
    values = {setting.name: setting.default for setting in SETTINGS}
    values["shm_dir"] = str(tmp_path)  # must exist
    values["socket"] = "ipc:///tmp/x-settings.sock"
    config = serve_config(values)
    plain = ServeConfig(shm_dir=str(tmp_path), endpoint="ipc:///tmp/x-settings.sock",
                        progress_bar=config.progress_bar)
    assert config == plain


def test_conversions_reach_the_config(tmp_path):
    values = {setting.name: setting.default for setting in SETTINGS}
    values.update(shm_dir=str(tmp_path), socket="ipc:///tmp/x-settings.sock", max_load_rate=250.0,
                  reload_root=(str(tmp_path),), progress=False, demo_vocab_size=77)
    config = serve_config(values)
    assert config.max_load_rate == 250e6 and config.reload_roots == [str(tmp_path)]
    assert config.progress_bar is False and config.demo_vocab_size == 77
    assert config.events_endpoint == "ipc:///tmp/x-settings.sock.events"
