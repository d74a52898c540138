-- replaces checksum: 508835e60e4599afac392326ec38ee7245a32ed2ca40927ebd37be76c3eac1ce
--
-- This migration only replaced functions (claim_tasks, deliver_signals and a
-- second commit_turns); their bodies now live in schema/functions/.
SELECT 1;
