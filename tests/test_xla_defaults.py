"""bertjax.runtime.xla_defaults: which XLA:CPU flags bertjax adds, and when it leaves XLA_FLAGS
alone."""

from bertjax.runtime import xla_defaults


def test_adds_flags_after_the_users_own(monkeypatch):
  monkeypatch.setattr(xla_defaults, "CHECKED_JAXLIB", (xla_defaults.version_of_jaxlib(),))
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "BERTJAX_XLA_DEFAULTS": "1"}
  assert xla_defaults.apply(env) == list(xla_defaults.CPU_FLAGS)
  assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8",
                                      *xla_defaults.CPU_FLAGS]
  assert xla_defaults.onednn_active(env)
  assert xla_defaults.apply(env) == [] and env["XLA_FLAGS"].count("onednn") == 2  # idempotent


def test_leaves_flags_alone_unless_asked_or_when_unsure(monkeypatch):
  monkeypatch.setattr(xla_defaults, "CHECKED_JAXLIB", (xla_defaults.version_of_jaxlib(),))
  # Off unless asked for: the oneDNN path crashed on an AVX2 CPU (bertjax/runtime/xla_defaults.py).
  for off in ({}, {"BERTJAX_XLA_DEFAULTS": "0"}, {"BERTJAX_XLA_DEFAULTS": "yes"}):
    assert xla_defaults.apply(off) == [] and "XLA_FLAGS" not in off
  mine = {"XLA_FLAGS": "--xla_cpu_use_onednn=false", "BERTJAX_XLA_DEFAULTS": "1"}
  assert xla_defaults.apply(mine) == [xla_defaults.CPU_FLAGS[1]]
  assert "--xla_cpu_use_onednn=false" in mine["XLA_FLAGS"] and not xla_defaults.onednn_active(mine)
  monkeypatch.setattr(xla_defaults, "CHECKED_JAXLIB", ("0.0.0",))
  other = {"BERTJAX_XLA_DEFAULTS": "1"}
  assert xla_defaults.apply(other) == [] and "XLA_FLAGS" not in other
