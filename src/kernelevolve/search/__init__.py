"""Selection strategies and the optimization loop."""
from kernelevolve.search.loop import SearchConfig, SearchOutcome, run_search
from kernelevolve.search.select import GreedySelector, Selector, best_node, make_selector

__all__ = ["GreedySelector", "SearchConfig", "SearchOutcome", "Selector", "best_node", "make_selector", "run_search"]
