"""What reads runs: curves and tables from run directories, figures, and the HTML report.

It only reads files that :mod:`hetfed.runs` wrote (and imports from it, never the other way).
"""
