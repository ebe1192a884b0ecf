"""The study and its report: run everything behind the three questions, draw the figures,
generate the verdicts from the measured numbers, write HTML and Markdown (``qkvlab study``)."""
