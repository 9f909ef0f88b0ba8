-- 999_next.sql - not a migration of pgjobd: the one migration more that the "next
-- version" of tests/integration/t_29_rolling_upgrade.sh has (build/tests/pgjobd-next, made
-- from the same sources with this file embedded after sql/'s). It changes pgjobd.jobs as
-- a real upgrade may, which takes the table's ACCESS EXCLUSIVE lock: a running
-- transaction-mode job holds the table (its row lock) until it ends, so pgjobd migrate
-- must wait for it without holding back producers' INSERTs meanwhile.
ALTER TABLE pgjobd.jobs ADD COLUMN next_note text;
