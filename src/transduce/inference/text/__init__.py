"""The text around the search, used by every translator (:class:`~transduce.inference.translation.BaseTranslator`):

- :mod:`.markup`: inline tags, placeholders and URLs taken out before translation and put back after;
- :mod:`.alignment`: word alignments of translations from cross-attention (and markup restored at them);
- :mod:`.terms`: where a translation's constraints come from (the input line, a glossary).

Below the front doors: nothing here imports a translator. Document translation and streaming, which
call one, are front doors themselves (:mod:`transduce.inference.documents`, :mod:`transduce.inference.streaming`).
"""
