"""What the accuracy gate's perplexity bound judged: the text scored (edgekit's held-out text, or a user's own file
in `edgekit eval --text FILE`), or (where the FP model scores that text worse than a uniform guess: random-weight
presets) the FP model's own predictions, through exp(mean KL) - 1.

Its own module because the CLI's summary lines name these without loading torch (``edgekit.quant.gate`` does).
"""

JUDGED_BY_TEXT = "held-out text"  # edgekit's own held-out set (edgekit/quant/data/heldout.txt), the gate's
JUDGED_BY_KL = "the FP model's own predictions (it scores the text worse than a uniform guess)"


def text_file(path) -> str:
    """What a user's own text (`edgekit eval --text FILE`) is called in figures and messages: the file, by the path
    given; never "held-out text", which names edgekit's own held-out set."""
    return f"text file {path}"
