"""Step 1 of DeepSZ: pruning, with retraining of the FC tail or one-shot from calibration inputs.

    masks          the mask policy: magnitude masks, sparsity targets, already-sparse layers
    train          the FC tail's trainer: masked Adam, distillation, gradual pruning (numpy or GPU)
    retraining     magnitude pruning + retraining (dsz prune --train), auto sparsity's final retraining
    auto_sparsity  auto sparsity as a plan: per-layer loss curves, bytes per sparsity, the search
    auto_retrain   auto with retraining: brief-retraining trials and the candidate schedules
    gptq           GPTQ/SparseGPT's arithmetic: Hessians from calibration inputs, the column sweep
    oneshot        one-shot pruning of any layer from calibration inputs (SparseGPT), no training
"""
