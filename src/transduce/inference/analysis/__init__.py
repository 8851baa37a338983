"""Looking inside a trained model's decoding, for people rather than for the search:

- :mod:`.attention_maps`: the encoder self-, decoder self- and cross-attention maps of one translation;
- :mod:`.attention_stats`: attention health over a file, per layer, head and kind.

:mod:`transduce.viz.attention_heatmaps` draws both.
"""
