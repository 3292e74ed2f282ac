"""The main job: plan -> measure -> verify -> encode under one budget, and what it reports.

    pipeline        compress(): assess, choose bounds by the knapsack, verify on the decoded file, encode
    compensation    GPTQ-compensated encoding: each bound's errors pushed into the weights not yet quantized
    prune_compress  prune then compress under one --max-loss (dsz compress --prune auto)
    unreached       bounds by analogy for the layers no sample of the data reaches
    footprint       the peak-memory bound that compress and prune print
    report          the per-layer table, report.json and curves.png
    demo            the main job on a bundled model (dsz demo)
"""
