"""web_sessions: session windows (30 minutes of inactivity close a session) per site session."""
