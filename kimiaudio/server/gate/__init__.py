"""Where requests enter: JSON errors, access control (API key, Host, Origin), admission slots, body limits, and the checks of JSON, path parameters and SDP offers."""
