"""The model as pydsz reads and runs it: the TFLite graph, interpreters over data, cuts and chains
of sub-models, the FC tail in numpy, sparse layers, data sets, caches, which layers a command takes.

    graph      TFLite model I/O (TFLiteModel: layers, constants, replace)
    runtime    running a model over a data set in batches, capturing intermediate tensors
    cut        sub-models from a cut: the ops from one on, fed with the tensors that cross it
    chain      the activations that cross each cut, computed once, cut after cut
    tail       the FC tail in numpy: cache a layer's input once, run the rest fast
    sparse     pruned layers at the cost of their non-zeros (CSR and libdsz's kernel)
    data       .npz data sets, folders of images, Fashion-MNIST from Debian
    cache      activations kept in memory or mapped from disk
    selection  which layers a command compresses: kinds, names, the size floor
"""
