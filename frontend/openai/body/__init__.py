"""Reading a request body: bounded in size and time, counted before it is decoded, decoded into its struct."""
