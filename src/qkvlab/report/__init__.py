"""Reports as typed page blocks (``blocks``): small dataclasses (title, section, paragraph,
table, figure, verdict, ...) that each render as HTML and as Markdown, written as one
self-contained page (``index.html`` with inline CSS, figures beside it) and ``report.md``.
The study that builds its page from these is ``qkvlab.studies.qkv`` (``qkvlab study``)."""
