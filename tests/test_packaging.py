"""`pip install .` gives an importable package that works outside the repository, and the
ranges pyproject.toml declares hold the exact pins of the requirements files."""

import os
import pathlib
import shutil
import site
import subprocess
import tomllib
import venv

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_then_import_from_another_folder(tmp_path):
  # Nothing is downloaded here, so the build backend must already be installed (a Python 3.12
  # venv comes without setuptools).
  pytest.importorskip("setuptools", reason="needs setuptools installed (nothing is downloaded)")
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
  for name in ("pyproject.toml", "README.md"):  # the dependencies are declared in pyproject.toml
    shutil.copy(REPO / name, source / name)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
  build = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", str(source)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert build.returncode == 0, build.stderr[-3000:]
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  code = ("import bertjax, bertjax.trainer.train, bertjax.data.sources as s, pathlib; "
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


def _declared(requirements):
  """Maps each canonical package name to its Requirement (its name, extras and range)."""
  parsed = [Requirement(line) for line in requirements]
  return {canonicalize_name(r.name): r for r in parsed}


def _pinned(path):
  """The `name==version` lines of a requirements file, as {canonical name: Requirement}."""
  lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
  return _declared(line for line in lines if line and not line.startswith("-"))


def pin_problems(pinned, declared):
  """What is wrong between exact pins and declared ranges: one line per problem, none if fine.

  Every pin must be exact (`==`), declared, and inside its declared range; every declared
  package must be pinned.
  """
  problems = []
  for name, pin in pinned.items():
    exact = [s for s in pin.specifier if s.operator == "=="]
    if len(exact) != 1 or len(pin.specifier) != 1:
      problems.append(f"{pin} is not an exact pin")
    elif name not in declared:
      problems.append(f"{pin} is pinned but not declared")
    elif not declared[name].specifier.contains(exact[0].version, prereleases=True):
      problems.append(f"{pin} lies outside the declared {declared[name]}")
  problems += [f"{declared[name]} is declared but not pinned" for name in declared
               if name not in pinned]
  return problems


def _project():
  return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_runtime_pins_lie_inside_the_declared_ranges():
  project = _project()
  assert "dependencies" not in project.get("dynamic", [])
  declared = _declared(project["dependencies"])
  assert not pin_problems(_pinned(REPO / "requirements.txt"), declared)
  # A library declares ranges: no runtime dependency is itself an exact pin.
  assert all(not any(s.operator == "==" for s in r.specifier) for r in declared.values())
  assert all(not r.specifier.contains("0") for r in declared.values())  # each has a lower bound


def test_test_pins_lie_inside_the_test_extra():
  declared = _declared(_project()["optional-dependencies"]["test"])
  assert not pin_problems(_pinned(REPO / "requirements-test.txt"), declared)


def test_accelerator_extras_bring_jax_over_the_same_range():
  project = _project()
  jax = _declared(project["dependencies"])["jax"]
  for extra in ("cuda12", "cuda13", "tpu"):
    (requirement,) = project["optional-dependencies"][extra]
    requirement = Requirement(requirement)
    assert requirement.name == "jax" and requirement.extras == {extra}
    assert requirement.specifier == jax.specifier


def test_pin_problems_catches_a_pin_outside_its_range():
  declared = _declared(["jax>=0.10.2,<0.11", "numpy>=2,<3"])
  assert pin_problems(_declared(["jax==0.10.2", "numpy==2.4.6"]), declared) == []
  problems = pin_problems(_declared(["jax==0.11.2", "numpy==2.4.6"]), declared)
  assert problems == ["jax==0.11.2 lies outside the declared jax<0.11,>=0.10.2"]
  problems = pin_problems(_declared(["jax>=0.10", "tqdm==4.70.1"]), declared)
  assert problems == ["jax>=0.10 is not an exact pin", "tqdm==4.70.1 is pinned but not declared",
                      "numpy<3,>=2 is declared but not pinned"]
