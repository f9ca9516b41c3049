"""Planning: targets, tile solver, memory plan, static-shape buckets, roofline predictions."""
