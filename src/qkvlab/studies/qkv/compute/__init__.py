"""What the study computes from the results store: the measures on trained models and designs,
the store read back as tidy frames (``results.StudyData``), each comparison's effect and verdict
(``effects``: typed records with a status), and the tables derived from them that the page,
figures and sentences share. Nothing here formats text for the page."""
