"""The HTTP layer every route shares: settings, the Guard middleware, connection limits, bodies, errors in each API's
envelope, server-sent events, the preparation pool and metrics; it imports nothing else of engine/server/."""
