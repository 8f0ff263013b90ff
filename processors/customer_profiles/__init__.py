"""customer_profiles: each customer's profile versions, by the event time they became valid."""
