/* config-keys - prints every key of pgjobd.ini, one a line, from the key table the
 * daemon parses with (config_key_name), so that t_87_install.sh checks the
 * documentation against the program itself rather than against its source text. */
#include <stdio.h>

#include "config.h"

int main(void)
{
	const char *k;
	for (size_t i = 0; (k = config_key_name(i)) != NULL; i++)
		if (puts(k) == EOF)
			return 1;
	return fflush(stdout) == 0 ? 0 : 1;
}
