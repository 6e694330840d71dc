-- End of the sandbox's lifetime on CLOCK_BOOTTIME (ms), so a restarted
-- daemon resumes TTLs without trusting the wall clock.
ALTER TABLE sandboxes ADD COLUMN expires_boot_ms INTEGER;
