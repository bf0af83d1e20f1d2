"""What a run directory holds and how a run resumes (docs/architecture.md, "run/").

- directory.py: the plan of `output_dir` (a new run, a resume, or a refusal) and the rows a resume drops;
- checkpoint.py: `checkpoint-<step>/`, written to a temporary directory and renamed into place, found and loaded;
- state.py: the trainer's state inside a checkpoint (who writes it, restoring it on resume);
- faults.py: `StepGuard`, the state at each step's start, Ctrl-C / SIGTERM, and what a failing step saves.

The trainer uses all four; they use each other and, below them, config/, step/, policy/ and parallel/.
"""
