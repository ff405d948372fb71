"""`pip install .` gives an importable package that works outside the repository."""

import os
import pathlib
import shutil
import site
import subprocess
import venv

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_then_import_from_another_folder(tmp_path):
  # A fresh venv that also sees the packages of the environment running the tests (the pinned
  # dependencies, pip and setuptools are installed there, and nothing may be downloaded here):
  # only bertjax itself is built and installed into it.
  env_dir = tmp_path / "venv"
  venv.EnvBuilder(with_pip=False).create(env_dir)
  python = env_dir / "bin" / "python"
  inner = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
  pathlib.Path(inner, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds.
  source = tmp_path / "src"
  shutil.copytree(REPO / "bertjax", source / "bertjax", ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "requirements.txt", "requirements-test.txt", "README.md"):
    shutil.copy(REPO / name, source / name)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
  build = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", str(source)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert build.returncode == 0, build.stderr[-3000:]
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  code = ("import bertjax, bertjax.train, bertjax.data.sources as s, pathlib; "
          "print(bertjax.__file__); "
          "print(pathlib.Path(s.__file__).parent.joinpath('samples', 'wikitext2_test.raw').is_file())")
  run = subprocess.run([str(python), "-c", code], cwd=elsewhere, env=env, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  location, sample = run.stdout.split()
  assert pathlib.Path(location).is_relative_to(env_dir) and sample == "True"
  meta = subprocess.run([str(python), "-m", "pip", "show", "bertjax"], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "Requires:" in meta.stdout and "jax" in meta.stdout.split("Requires:")[1]
