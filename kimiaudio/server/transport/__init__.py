"""What carries a session: WebRTC (peer connection, audio tracks) and the Realtime WebSocket, and the
microphone's input clock."""
