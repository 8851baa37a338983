"""Running exported graphs in another runtime, behind the one ``runtime.backend`` choice
(:class:`~transduce.config.Runtime`): :func:`~transduce.inference.placement.prepared_for` puts the
graphs of ``runtime.engines`` in the model's place, so the front doors (Translator, Generator,
Classifier) and every search run unchanged over them.

- :mod:`.onnx`: the graphs' I/O contract and ONNX Runtime (CPU): a translation model's encoder
  and one-step decoder (:class:`~.onnx.GraphModel`), a language model's step
  (:class:`~.onnx.OnnxLM`), an encoder-only model's head (:class:`~.onnx.OnnxEncoder`,
  :class:`~.onnx.OnnxClassifier`); :func:`~.onnx.open_graphs` chooses.
- :mod:`.tensorrt`: the translation graphs built into TensorRT engines (CUDA).
- :mod:`.triton`: the rows of Triton Inference Server's ``translate`` model (requests in, one
  answer per row), which ``serve --engine triton`` and ``export --format triton`` both run.
"""
