"""Model files: tflite_io.py (the only flatbuffer code), onnx/ (the ONNX importer and writer) and
model_io.py (either, by the file's content)."""
