"""Harness: the runtime between planner and environment (tools, skills, memory, sub-agents,
structured feedback). Built in the next round; never imports jax."""
