"""What a budget is measured in and how decisions are judged against it.

    metrics        per-sample losses (top1, topk, agreement, output-error, psnr, cosine, a user's function)
    probabilities  a classifier's outputs as class probabilities, and their calibration on labels
    calibrated     calibrated-top1, what a top1 budget's decisions measure in
    rule           Budget: what may be lost, and the noise-margin rule every decision judges by
    knapsack       the multiple-choice knapsack over measured options (per-layer bounds, sparsities)
"""
