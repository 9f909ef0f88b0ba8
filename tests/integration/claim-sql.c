/* claim-sql - prints SQL that sets a session up as the daemon's claiming
 * sessions are (claim_sql_generic_plans) and prepares the statement the
 * daemon claims with (claim_sql_claim) as `qc`, its parameter types left to
 * the server as the daemon leaves them, so that t_44_claim_paths.sh and
 * t_45_backlog.sh run the very text the program sends, not a copy of its
 * source. */
#include <stdio.h>

#include "claim.h"

int main(void)
{
	if (printf("%s;\nPREPARE qc AS %s;\n", claim_sql_generic_plans, claim_sql_claim) < 0)
		return 1;
	return fflush(stdout) == 0 ? 0 : 1;
}
