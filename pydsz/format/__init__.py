"""What a device needs: the codec's binding, reading .dsz files and running what they decode to.

This stage imports no other of pydsz's (tests/test_structure.py checks it): the decoder a device
installs is this folder, pydsz/errors.py and the compiled extension pydsz._core.

    codec        compress_array / decompress_array / encode_sparse / decode_sparse(_csr): libdsz's streams
    container    the .dsz container read: DszModel, load (doc/format.md)
    spans        a gathered entry's places in the model, as decoders read and fill them
    files        reading input files and writing output without a partial file
    interpreter  a TFLite interpreter (LiteRT, tflite-runtime or TensorFlow) for decoded bytes
"""
