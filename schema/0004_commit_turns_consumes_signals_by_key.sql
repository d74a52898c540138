-- replaces checksum: bac933759778d6b46aeb32216174cf2c148e0daeb4124bbff6966a7831994b75
--
-- This migration only replaced commit_turns(); its body now lives in
-- schema/functions/commit_turns.sql.
SELECT 1;
