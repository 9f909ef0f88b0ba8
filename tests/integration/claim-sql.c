/* claim-sql - prints SQL that sets a session up as the daemon's claiming
 * sessions are (CLAIM_SQL_SESSION_SETUP: generic plans, no sequential scans,
 * no JIT) and prepares the statement the daemon claims with (claim_sql_claim)
 * as `qc`, its parameter types left to the server as the daemon leaves them,
 * so that t_44_claim_paths.sh, t_45_backlog.sh and bench 11c run the very
 * text the program sends, planned as the daemon's sessions plan it, not a
 * copy of its source. */
#include <stdio.h>

#include "claim.h"

int main(void)
{
	static const char *const setup[] = {CLAIM_SQL_SESSION_SETUP};
	for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
		if (printf("%s;\n", setup[i]) < 0)
			return 1;
	if (printf("PREPARE qc AS %s;\n", claim_sql_claim) < 0)
		return 1;
	return fflush(stdout) == 0 ? 0 : 1;
}
