"""What the study renders: verdict sentences, tables, figures and the page, formatted from the
records ``compute`` derives. A module here chooses words, layout and colours; the numbers it
shows come from ``compute``."""
