"""Fine-tuning tasks (GLUE, SQuAD, CoNLL-2003 tagging) as objectives of the one trainer.

Each task is an `Objective` registered in `bertjax.objectives.OBJECTIVES` ("glue", "squad",
"ner"); `python launch.py --config configs/{glue,squad,ner}.py ...` runs it through
`bertjax.train.train_and_evaluate` like any pretraining objective.
"""

# The registry imports the task modules and the task modules import the objective base class, so
# the registry must load first whichever of the two a caller imports: load it from here.
import bertjax.objectives  # pylint: disable=unused-import  # noqa: F401
