"""A resume on other code than the run last trained with says so in one line and goes on
(issue: "Same code everywhere"). WORKDIR/code.json records the digest of each of the package's
source files with the run's record; a resume compares them. The code cannot change under a test,
so the record is edited to what an older commit would have left: one file's digest differs."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
ARGS = ["--config", "configs/quickstart.py:runlocal", "--config.data.synthetic=True",
        "--config.model.vocab_size=200", "--config.model.hidden_size=32",
        "--config.model.intermediate_size=64", "--config.model.num_attention_heads=2",
        "--config.model.num_hidden_layers=2", "--config.max_seq_length=16",
        "--config.max_predictions_per_seq=4", "--config.tensorboard=False",
        "--config.checkpoint_every=2", "--config.eval_every=0", "--config.log_every=1",
        "--config.async_checkpointing=False"]


def _run(workdir, steps):
  return subprocess.run([sys.executable, "launch.py", *ARGS, f"--config.total_steps={steps}",
                         "--workdir", str(workdir)], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=600)


def test_a_resume_on_changed_code_says_which_files_in_one_line_and_goes_on(tmp_path):
  workdir = tmp_path / "run"
  r = _run(workdir, 2)
  assert r.returncode == 0, r.stderr[-2000:]
  record = json.loads((workdir / "code.json").read_text())["files"]
  assert "bertjax/models/encoder.py" in record and "bertjax/runtime/workdir.py" in record
  assert "changed since" not in r.stderr

  record["bertjax/models/encoder.py"] = "0" * 16  # as an older commit's encoder would read
  (workdir / "code.json").write_text(json.dumps({"files": record}))
  r = _run(workdir, 4)
  assert r.returncode == 0, r.stderr[-2000:]
  said = [l for l in r.stderr.splitlines() if "the code changed since" in l]
  assert len(said) == 1 and said[0].endswith(
      "the code changed since this run's last record: bertjax/models/encoder.py differs; going "
      f"on with the code here (noted in {workdir / 'changes.jsonl'})"), said
  entry = json.loads((workdir / "changes.jsonl").read_text().splitlines()[-1])
  assert entry["step"] == 2 and entry["code"] == ["bertjax/models/encoder.py"]
  assert json.loads((workdir / "summary.json").read_text())["step"] == 4
  # The new record is this code's: the next resume has nothing to say.
  assert json.loads((workdir / "code.json").read_text())["files"]["bertjax/models/encoder.py"] \
      != "0" * 16
