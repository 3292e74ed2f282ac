"""What `dsz bench` runs: pydsz against the anchors and what users pick instead.

    anchors     every method on one pruned model (DeepSZ, Deep Compression, int-b, float16, zstd)
    headtohead  the model as given against float16, per-channel int-b, the LiteRT Quantizer, whole files
    baselines   the anchors as per-tensor codecs
"""
