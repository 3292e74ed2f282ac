"""Step 2 of DeepSZ: each layer's loss in the budget's metric over a range of error bounds.

    evaluator  the Evaluator: what a candidate loses, running as little of the model as it can
    ladder     which bounds a layer is measured at (Ladder, Fitted)
    tasks      one candidate measured, a layer alone or a group (what an executor runs)
    plan       the evaluation planner: triage into groups, refinement by the allocation, progress
    executor   where evaluations run: this process (Local) or a Dask cluster
"""
