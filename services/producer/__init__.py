"""Producer SDK: contract-checked publishing, and a realistic event simulator."""
