"""What the accuracy gate's perplexity bound judged: the held-out text, or (where the FP model scores that text worse
than a uniform guess: random-weight presets) the FP model's own predictions, through exp(mean KL) - 1.

Its own module because the CLI's summary lines name these without loading torch (``edgekit.quant.gate`` does).
"""

JUDGED_BY_TEXT = "held-out text"
JUDGED_BY_KL = "the FP model's own predictions (it scores the text worse than a uniform guess)"
