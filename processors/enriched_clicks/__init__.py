"""enriched_clicks: search-result clicks joined with the customer's profile as of the click."""
