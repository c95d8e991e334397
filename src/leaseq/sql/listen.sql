LISTEN {channel}
