"""Fine-tuning tasks (GLUE, SQuAD, CoNLL-2003 tagging) as objectives of the one trainer.

Each task is an `bertjax.objective.Objective` registered in `bertjax.registry` ("glue", "squad",
"ner"); `python launch.py --config configs/{glue,squad,ner}.py ...` runs it through
`bertjax.trainer.train.train_and_evaluate` like any pretraining objective.
"""
