"""What a researcher meets in their first hour (issue 52, "The first hour"): the advice and
defaults a first run reads. Each test is in-process and small (no training unless it says so)."""

import ast
import re
import types

import PIL.Image
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bertjax.convert import readers
from bertjax.core.errors import UserError
from bertjax.models.config import ModelConfig
from bertjax.objectives import distill
from bertjax.prune import table
from bertjax.tools import report_plots
from configs import distill as distill_recipe

from helpers import REPO, load_config


def test_hub_download_advice_names_the_current_command():
  """huggingface_hub replaced `huggingface-cli download` by `hf download`: the refusal of a hub
  name, README and the distillation recipe name the command that exists."""
  with pytest.raises(UserError) as refused:
    readers.read_hf_config("bert-base-uncased")
  assert "(hf download bert-base-uncased --local-dir bert-base-uncased" in str(refused.value)
  for doc in (REPO / "README.md", REPO / "configs" / "distill.py"):
    text = doc.read_text()
    assert "hf download " in text and "huggingface-cli" not in text, doc


def test_distillation_quickstart_teacher_is_larger_than_its_student():
  """configs/distill.py's docstring trains the teacher its runlocal student distils from: the
  teacher has more weights than the student. The quickstart's own model (what README's first
  journey leaves in runs/quickstart) is the student's size, and is warned of as a teacher."""
  doc = distill_recipe.__doc__
  command = doc.split("python launch.py --config configs/quickstart.py")[1].split("python")[0]
  overrides = dict(o.split("=", 1) for o in re.findall(r"--config\.(\S+)", command))
  teacher = load_config("configs/quickstart.py", **{k: ast.literal_eval(v) if k != "objective"
                                                    else v for k, v in overrides.items()})
  student = load_config("configs/distill.py:runlocal").model
  as_model = lambda c: ModelConfig.from_dict(c.to_dict())
  t, s = as_model(teacher.model), as_model(student)
  assert distill.weight_count(t) > distill.weight_count(s) and t.num_hidden_layers == 4
  assert distill.size_warning(s, t, "distill.teacher=runs/teacher") == ""
  same = as_model(load_config("configs/quickstart.py").model)
  assert distill.size_warning(s, same, "distill.teacher=runs/quickstart").startswith(
      "warning: the student (2 layers, hidden 128) is not smaller than its teacher "
      "distill.teacher=runs/quickstart (2 layers, hidden 128)")


def _title_width_px(title: str, fontsize, dpi: int = 100) -> float:
  """The width a title takes drawn at `dpi`, measured on a figure of its own."""
  fig = Figure(figsize=(2, 2), dpi=dpi)
  ax = fig.subplots()
  text = ax.set_title(title, fontsize=fontsize)
  fig.canvas = FigureCanvasAgg(fig)
  return text.get_window_extent(fig.canvas.get_renderer()).width


def test_plot_titles_are_not_cropped(tmp_path):
  """A report's and a pruning's png hold their whole title: the saved image is at least as wide
  as the title's extent at the figure's dpi (on 61c1c42 a long run name was cut at 900 px)."""
  name = "runs/" + "a_long_run_name_" * 8
  point = types.SimpleNamespace(name=name, setting=(), train_steps=[1, 2], train_loss=[3.0, 2.0])
  data = report_plots.plot_train_loss([point], tmp_path / "loss.png")
  width = PIL.Image.open(tmp_path / "loss.png").size[0]
  assert width >= _title_width_px(data["title"], "large") > 900, width
  rows = [{"heads_kept": 1.0, "dev_pruned": 0.8, "dev_finetuned": None},
          {"heads_kept": 0.5, "dev_pruned": 0.7, "dev_finetuned": 0.75}]
  title = table.plot(rows, "a_long_metric_name_" * 3, tmp_path / "pruning.png", False)
  width = PIL.Image.open(tmp_path / "pruning.png").size[0]
  assert width >= _title_width_px(title, 10) > 600, width
