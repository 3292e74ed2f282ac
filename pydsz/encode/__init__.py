"""Writing .dsz files: each weight encoded at its bound, small tensors gathered, the container assembled.

    tensor     what the container does to one weight at a bound (stream, sizes, decoded values)
    gather     small kernels and constants sharing streams, each within its own bound
    constants  which constants may be gathered, and their bounds
    pack       the container written: pack_model, write_model
"""
