"""search_ctr: click-through rate per search term, a stream-stream join of searches and clicks."""
