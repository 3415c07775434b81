"""Evaluation: every candidate in a fresh process, judged by the parent against reference outputs it alone holds."""
from kernelevolve.evaluate.evaluator import EvalConfig, Evaluator, JudgeSettings, fresh_seed, make_evaluator
from kernelevolve.evaluate.feedback import describe_failure, mismatch_report, mismatch_text
from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
from kernelevolve.evaluate.timing import TimingConfig

__all__ = ["Baseline", "EvalConfig", "Evaluator", "JudgeSettings", "Result", "Status", "Timing", "TimingConfig",
           "describe_failure", "fresh_seed", "make_evaluator", "mismatch_report", "mismatch_text"]
