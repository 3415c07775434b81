"""Selection strategies and the optimization loop."""
from kernelevolve.search.loop import run_search
from kernelevolve.search.state import SearchConfig, SearchOutcome
from kernelevolve.search.select import GreedySelector, Selector, best_node, make_selector

__all__ = ["GreedySelector", "SearchConfig", "SearchOutcome", "Selector", "best_node", "make_selector", "run_search"]
