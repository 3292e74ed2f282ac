"""edge_demo: decode a .dsz model on a device, time each decoding stage, and run it in TensorFlow Lite.

    python -m edge_demo MODEL.dsz [--data TEST.npz] [--write-tflite MODEL.tflite] [--threads N]

Needs only the decoder install of pydsz (numpy, zstandard and the compiled extension) to decode,
and a TFLite runtime (ai-edge-litert or tflite-runtime) to classify. README.md says how to install
it on Raspberry Pi OS and Jetson.
"""
